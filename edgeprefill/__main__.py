from edgeprefill.cli.main import main

main()
