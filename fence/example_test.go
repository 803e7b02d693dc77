package fence_test

import (
	"errors"
	"fmt"

	"github.com/dlockio/dlock/fence"
)

// The rule every guard applies: equal tokens pass, lower ones fail with the newer
// token, token 0 never passes.
func ExampleCheck() {
	mark := uint64(41)
	for _, token := range []uint64{41, 42, 40, 0} {
		err := fence.Check("orders/7", mark, token)
		var stale *fence.StaleError
		switch {
		case err == nil:
			mark = token
			fmt.Println(token, "accepted")
		case errors.As(err, &stale):
			fmt.Println(token, "refused: the resource has seen", stale.Current)
		case errors.Is(err, fence.ErrNoToken):
			fmt.Println(token, "refused: no fencing token")
		}
	}
	// Output:
	// 41 accepted
	// 42 accepted
	// 40 refused: the resource has seen 42
	// 0 refused: no fencing token
}

// After a move to another lock backend whose tokens start lower than the marks the
// resources hold, every writer adds the same offset, above the highest mark.
func ExampleOffset() {
	const highestMark = 1_700_000_000_000_000 // e.g. the largest token in the fence table
	offset := fence.Offset(highestMark)
	token, err := offset.Apply(12) // the new backend's token
	fmt.Println(token, err, fence.Check("orders/7", highestMark, token) == nil)
	// Output: 1700000000000012 <nil> true
}
