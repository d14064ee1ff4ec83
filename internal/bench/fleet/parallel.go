package fleet

import (
	"runtime"
	"sync"
)

// runEach calls f for every index below n on parallel goroutines (0:
// GOMAXPROCS) and, once all are done, returns the error of the lowest index
// that failed.
func runEach(n, parallel int, f func(i int) error) error {
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	ch := make(chan int)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for i := range ch {
				errs[i] = f(i)
			}
		})
	}
	for i := range n {
		ch <- i
	}
	close(ch)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
