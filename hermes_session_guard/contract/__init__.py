"""The session-stability contract in code: compression generations, sessions compressing now,
the gateway transcript re-base."""
