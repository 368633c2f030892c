"""HTTP plumbing of the API, below the routes: error shapes, body limits and strict bodies, admission,
request metrics, conditional requests and ETags, and the error answers the OpenAPI description declares.

Nothing is imported here: :mod:`halfcast.common.strict_json` serves the client too, which has no web framework.
"""
