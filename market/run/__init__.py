"""Running episodes: one episode (rollout), many (runner, the async and Ray backends),
evaluation and tournaments (the reports built from them are ``market.review``)."""
