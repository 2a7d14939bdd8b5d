class UserError(Exception):
    """A mistake in what the user asked for (bad spec, bad file, missing binary).

    Every CLI catches it once and prints its message as one line, exit code 2. The message names the
    problem and what to do instead.
    """


def read_text(path, what: str, fix: str) -> str:
    """A text file's contents, or a UserError naming it as `what` with `fix` (not UTF-8, unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: {what} is not UTF-8 text (byte {e.start}); {fix}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read the {what} ({e.strerror}); {fix}") from None


def read_json(path, what: str, fix: str) -> object:
    """A JSON file's value, or a UserError naming it as `what` with `fix` (unreadable, not UTF-8, not JSON)."""
    import json

    try:
        return json.loads(read_text(path, what, fix))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg}); {fix}") from None
