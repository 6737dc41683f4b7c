"""The mesh: peer links, link-state routing with interest, envelopes (pure cores)."""
