import sys

from db.cli import main

sys.exit(main())
