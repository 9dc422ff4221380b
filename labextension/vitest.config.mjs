// Unit tests for the pure parts of the panel (formatting, state mapping, event application, URLs, backoff).
// They run in plain Node: nothing here needs a DOM or JupyterLab.
export default {
  test: {
    include: ['src/__tests__/**/*.spec.ts'],
    environment: 'node'
  }
};
