"""``crew-supervisor doctor``: a deployment checked before it serves, each problem with its fix."""
