import sys

from controlplane.cli.tenantctl import main

sys.exit(main())
