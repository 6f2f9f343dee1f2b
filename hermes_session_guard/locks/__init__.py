"""Who may run now: one compression per session, turn order, repair exclusivity, lock-holder liveness, presence."""
