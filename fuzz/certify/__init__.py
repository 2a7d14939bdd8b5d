"""The CI product, `family-certify`: the manifest's lanes over real targets (lanes.py), the process-pool battery
(battery.py), bump and its cross-build verdicts, mutants, the upstream corpus, certificates and admission, the
outputs CI reads (summary, JUnit, JSON reports and their schemas), shards. The top floor: it imports the rest of
fuzz, nothing imports it but its own modules."""
