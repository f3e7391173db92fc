"""API errors with toxiproxy's JSON shape: ``{"error": message, "status": code}``."""

from __future__ import annotations


class ApiError(Exception):
    """An error the HTTP API reports with ``status`` and a message."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def to_json(self) -> dict[str, object]:
        return {"error": self.message, "status": self.status}


def bad_request(detail: str) -> ApiError:
    """400 with toxiproxy's ``bad request body: ...`` prefix."""
    return ApiError(f"bad request body: {detail}", 400)


def proxy_not_found() -> ApiError:
    return ApiError("proxy not found", 404)


def proxy_exists() -> ApiError:
    return ApiError("proxy already exists", 409)


def toxic_not_found() -> ApiError:
    return ApiError("toxic not found", 404)


def toxic_exists() -> ApiError:
    return ApiError("toxic already exists", 409)


def missing_field(name: str) -> ApiError:
    """400 for a required field that is absent or empty."""
    return ApiError(f"missing required field: {name}", 400)
