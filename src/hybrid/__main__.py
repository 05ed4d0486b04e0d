from hybrid.cli.main import main

main()
