"""The trainer's client (sync `Client` and asyncio `AsyncClient`): submit, results, publish,
cancel, status, drain.

May import: controller.contracts. Must not import: controller.store, controller.broker,
nodeagent.
"""
from controller.client.api import (
                                   AsyncClient,
                                   BadRequest,
                                   BandRequest,
                                   Client,
                                   ClientError,
                                   ControllerUnavailable,
                                   PolicyConflict,
                                   RequestRefused,
                                   UnknownBatch,
                                   UnknownNode,
                                   UnknownPolicy,
                                   UnknownTask,
)

__all__ = ["AsyncClient", "BadRequest", "BandRequest", "Client", "ClientError", "ControllerUnavailable",
           "PolicyConflict", "RequestRefused", "UnknownBatch", "UnknownNode", "UnknownPolicy", "UnknownTask"]
