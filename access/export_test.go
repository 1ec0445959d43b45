package access

// DummyMade reports whether the service has made its dummy hash (tests of when it is made).
func DummyMade(s *Service) bool { return s.dummy != nil }
