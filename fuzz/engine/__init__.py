"""The differential engine's pieces every oracle shares: the oracle contract and its statuses, stage cuts and
slicing, the schedules and parity runs of a split chain, configs, progress, fixture paths. Imports nothing else
of fuzz."""
