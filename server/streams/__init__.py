"""The API's Server-Sent Event streams: one core (:mod:`server.streams.sse`) under the job event stream
(:mod:`server.streams.events`) and the log follow stream (:mod:`server.streams.logstream`).
"""
