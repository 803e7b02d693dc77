package driver

import "strings"

// Join returns an error that wraps every non-nil error of errs (errors.Is and
// errors.As see each, as with errors.Join) and reads as one line: their texts
// joined by "; ", newlines inside a text flattened, and a text left out when it is
// already part of another one (the same sentinel wrapped twice). It returns nil
// when every error is nil, and the error itself when only one is not. The core and
// the backends join errors with it, so that every error they return is one line.
func Join(errs ...error) error {
	var kept []error
	for _, err := range errs {
		if err != nil {
			kept = append(kept, err)
		}
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		if !strings.Contains(kept[0].Error(), "\n") {
			return kept[0]
		}
	}
	return &joined{errs: kept}
}

type joined struct{ errs []error }

func (j *joined) Error() string {
	var texts []string
	for _, err := range j.errs {
		t := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
		if t == "" {
			continue
		}
		dup := false
		for i, prev := range texts {
			if strings.Contains(prev, t) {
				dup = true
				break
			}
			if strings.Contains(t, prev) {
				texts[i], dup = t, true
				break
			}
		}
		if !dup {
			texts = append(texts, t)
		}
	}
	return strings.Join(texts, "; ")
}

func (j *joined) Unwrap() []error { return j.errs }
