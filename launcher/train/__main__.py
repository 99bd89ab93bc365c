import sys

from launcher.train.cli import main

sys.exit(main())
