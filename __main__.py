from specpair.cli import main

main()
