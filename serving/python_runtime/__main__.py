import sys

from serving.python_runtime.cli import main

sys.exit(main())
