"""The oracles, one module each, every one exporting its `ORACLE` (fuzz/engine/contract.py); registry.py looks
them up by name. An oracle imports the engine and, where one builds on another, another oracle; never repro or
certify."""
