import sys

from boltbeam.cli import main

# Guarded: tinygrad's BEAM search starts worker processes that import this module again.
if __name__ == "__main__":
    sys.exit(main())
