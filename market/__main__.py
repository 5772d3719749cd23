import sys

from market.cli import main

sys.exit(main())
