"""Graph nodes, one per scaffold step (STYLE §3). Each returns a Command whose Literal names where it can go."""
