"""fuzz: the differential engine. Talks to targets only through the protocol (targets.Target)."""
