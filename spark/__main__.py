import sys

from spark.audit import main

sys.exit(main())
