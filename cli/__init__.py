"""The `switchboard` command and the embedded dev stack: the entry points, importing everything else."""
