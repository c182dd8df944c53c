from dynamiccl.cli import entry

entry()
