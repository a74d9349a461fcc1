from grpoplus.cli import entry

entry()
