"""kopt.agent: profile → propose → verify → benchmark → remember. Packaged as ``kopt.agent``."""
