// The output folder lock: exclusive, names its holder, reports a crashed one.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/train/output_lock.h"

namespace fs = std::filesystem;
using namespace rd;
using namespace rd::train;

TEST_CASE("the output folder lock is exclusive, names its holder and reports a crashed one", "[train]") {
  const fs::path dir = fs::temp_directory_path() / ("rd_lock_test." + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::string stale = "x";
    OutputLock a = OutputLock::acquire(dir.string(), &stale);
    CHECK(a.held());
    CHECK(stale.empty());
    try {
      OutputLock::acquire(dir.string());
      FAIL("a second lock on the same folder was granted");
    } catch (const UsageError& e) {
      const std::string m = e.what();
      CHECK(m.find("'" + dir.string() + "' is in use by another run") != std::string::npos);
      CHECK(m.find(" pid " + std::to_string(::getpid()) + " ") != std::string::npos);
    }
    CHECK(a.held());  // the refused attempt left the holder's record alone
  }
  {
    std::ifstream f(dir / "resnet_ddp.lock");
    std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    CHECK(content.empty());  // released cleanly
  }
  {
    std::ofstream(dir / "resnet_ddp.lock") << "host h pid 1 since then\n";  // as a killed holder leaves it
    std::string stale;
    OutputLock b = OutputLock::acquire(dir.string(), &stale);
    CHECK(stale == "host h pid 1 since then");
  }
  fs::remove_all(dir);
}
