class UserError(Exception):
    """A mistake in what the user asked for (bad spec, bad file, missing binary).

    Every CLI catches it once and prints its message as one line, exit code 2. The message names the
    problem and what to do instead.
    """
