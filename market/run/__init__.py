"""Running episodes: one episode (rollout), many (runner, the async and Ray backends),
evaluation, mechanism comparison and tournaments."""
