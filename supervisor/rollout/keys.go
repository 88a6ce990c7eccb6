package rollout

// Rollout keys.
const prefixRollout = "rollouts/" // rollouts/<id> → Rollout (JSON)

func rolloutKey(id string) []byte { return []byte(prefixRollout + id) }
