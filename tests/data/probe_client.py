"""The Python side of data_probe (tests/data/data_probe.cpp): one request line in,
one reply line out, over a pipe to one long-running process. The data tests that
compare our decoder and transforms with PIL / torchvision share it."""
import subprocess


class Probe:
    def __init__(self, path, raise_errors=False):
        # raise_errors: an "error ..." reply raises instead of being returned (callers
        # that expect refusals want the reply text).
        self.raise_errors = raise_errors
        self.p = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        reply = self.p.stdout.readline().strip()
        if self.raise_errors and reply.startswith("error"):
            raise RuntimeError(f"data_probe: {line}: {reply}")
        return reply
