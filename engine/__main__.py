import sys

from surecall.cli import main

sys.exit(main())
