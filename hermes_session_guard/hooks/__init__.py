"""Extension points: the pluggy hook specs, the built-in hooks, the plugin manager."""
