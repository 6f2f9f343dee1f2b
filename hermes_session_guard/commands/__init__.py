"""One module per operator command: ``HELP``, ``add_arguments(parser)``, ``run(args) -> int``."""
