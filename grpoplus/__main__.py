import sys

from grpoplus.cli import main

sys.exit(main())
