import sys

from llumnix.lite.serve import main

sys.exit(main())
