"""The broker's messages of queued jobs: acknowledged when claimed, held, and re-sent when a broker lost them."""
