"""The one error the exam service maps to an HTTP status."""


class ExamError(Exception):
    """Maps to an HTTP status: 401 not signed in, 403 not yours, 404 unknown, 409 conflict, 410 expired,
    422 bad input, 429 limit."""

    status = 400

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status
