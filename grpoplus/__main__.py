from grpoplus.entry.cli import entry

entry()
