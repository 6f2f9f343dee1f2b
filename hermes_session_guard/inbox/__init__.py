"""Messages that arrive while their session compresses: the repository over the guard's inbox table."""
