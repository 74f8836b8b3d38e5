"""``gcp-storage-emulator`` with Cloud Storage's generation preconditions, which it ignores.

Real GCS refuses an upload, download or delete whose ``ifGenerationMatch`` names another
generation than the live object's (0: no live object) with 412 Precondition Failed. The output
lock (``transforms/io/output_lock.py``) is built on exactly that, so the tests run the emulator
with the check added in front of those handlers, atomically (one lock for every checked
request). Run as the emulator's own command line: ``python gcs_preconditions.py start ...``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_CHECKED = threading.Lock()


def _object_id(request: Any) -> str:
    if "object_id" in request.params:
        return request.params["object_id"]
    if "name" in request.query:
        return request.query["name"][0]
    return request.data["meta"].get("name")  # a multipart upload names it in its metadata


def with_precondition(handler: Callable) -> Callable:
    def checked(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = request.query.get("ifGenerationMatch")
        if not wanted:
            return handler(request, response, storage, *args, **kwargs)
        with _CHECKED:
            try:
                live = storage.get_file_obj(request.params["bucket_name"],
                                            _object_id(request))["generation"]
            except NotFound:
                live = "0"
            if live != wanted[0]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "Precondition Failed",
                                         "errors": [{"reason": "conditionNotMet"}]}})
                return None
            return handler(request, response, storage, *args, **kwargs)
    return checked


objects.insert = with_precondition(objects.insert)
objects.download = with_precondition(objects.download)
objects.delete = with_precondition(objects.delete)

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main

    main()
