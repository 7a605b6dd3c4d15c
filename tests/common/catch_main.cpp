// One Catch2 main per test executable.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
