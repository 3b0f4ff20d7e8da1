"""Pitfall packs: framework-specific knowledge (torch, keras) and shared optimisation knowledge."""
