from grpokit.cli.main import program

program()
