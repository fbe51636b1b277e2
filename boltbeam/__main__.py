import sys

from boltbeam.cli import main

sys.exit(main())
