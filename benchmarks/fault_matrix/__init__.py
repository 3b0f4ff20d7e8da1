"""The fault matrix: healthy base programs x fault operators, a runner, confusion tables."""
