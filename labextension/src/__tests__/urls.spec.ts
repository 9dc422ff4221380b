import { describe, expect, it } from 'vitest';

import { apiUrl, eventsUrl, statusUrl } from '../urls';

describe('URLs under a base_url', () => {
  it('builds from the root base url', () => {
    expect(statusUrl('http://127.0.0.1:8888/')).toBe('http://127.0.0.1:8888/lancefn/status');
    expect(apiUrl('http://127.0.0.1:8888/', 'gpu/classes')).toBe(
      'http://127.0.0.1:8888/lancefn/api/v1/gpu/classes'
    );
  });

  it('keeps a non-root base url (JupyterHub, proxies)', () => {
    expect(statusUrl('http://h/jl/')).toBe('http://h/jl/lancefn/status');
    expect(statusUrl('http://h/jl')).toBe('http://h/jl/lancefn/status');
    expect(apiUrl('/user/ana/', '/jobs/list')).toBe('/user/ana/lancefn/api/v1/jobs/list');
  });

  it('puts the token and resume id in the event stream query', () => {
    expect(eventsUrl('http://h/jl/')).toBe('http://h/jl/lancefn/api/v1/jobs/events');
    expect(eventsUrl('http://h/jl/', { token: '' })).toBe('http://h/jl/lancefn/api/v1/jobs/events');
    expect(eventsUrl('http://h/jl/', { token: 'a b&c', lastEventId: '42' })).toBe(
      'http://h/jl/lancefn/api/v1/jobs/events?last_event_id=42&token=a%20b%26c'
    );
  });
});
