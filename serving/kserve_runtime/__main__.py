import sys

from serving.kserve_runtime.cli import main

sys.exit(main())
