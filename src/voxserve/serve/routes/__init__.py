"""The HTTP app's routers, one per area, each over the app's `SpeechService`."""
