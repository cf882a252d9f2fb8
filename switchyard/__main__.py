from switchyard.cli import main

raise SystemExit(main())
