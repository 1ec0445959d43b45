package payments

import "context"

// BeatNow writes this replica's heartbeat row now, as the patrol's ticker does during a round
// (for tests that read it mid-round).
func (s *Service) BeatNow(ctx context.Context) { s.beat(ctx) }
