package access

// DummyMade reports whether the service has made its dummy hash (tests of when it is made).
func DummyMade(s *Service) bool { return s.dummy != nil }

// SetSignInRoom gives the service room for n sign-ins at once (signInRoom): tests of what many
// sign-ins on one pool do to each other.
func SetSignInRoom(s *Service, n int) { s.signIns = make(chan struct{}, n) }
